"""SAASBO for Optuna: Bayesian optimisation with a sparse axis-aligned subspace GP prior.

Eriksson & Jankowiak, "High-dimensional Bayesian optimization with sparse axis-aligned
subspaces" (UAI 2021): a GP whose lengthscales have a half-Cauchy shrinkage prior, fitted by NUTS
(fully Bayesian), with log expected improvement over the posterior samples. The thesis uses it
(through Ax) for the high-dimensional direct layouts (seeds/000 §5.4, Figs 5.9-5.12).

Here it is BoTorch's `SaasFullyBayesianSingleTaskGP` behind optuna-integration's
`BoTorchSampler` (`pip install -e '.[saasbo]'`). The sampler asks once per trial; the model is
refitted only when new results have arrived, so a batch of proposals costs one NUTS fit and
each further proposal of the batch conditions on the pending ones (`X_pending`).
"""

from __future__ import annotations

from typing import Any

# NUTS settings: BoTorch's SAASBO tutorial uses 512 warm-up steps and 256 samples; these are a
# quarter of that, to keep a fit to seconds on a CPU (the thesis notes SAASBO is much slower).
WARMUP_STEPS = 128
NUM_SAMPLES = 64
THINNING = 16


class SaasCandidates:
    """`candidates_func` for BoTorchSampler: one NUTS fit per new set of results."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.fitted: tuple[Any, Any] | None = None  # (data key, model)

    def __call__(self, train_x: Any, train_obj: Any, train_con: Any, bounds: Any, pending_x: Any) -> Any:
        import torch
        from botorch.acquisition.logei import qLogExpectedImprovement
        from botorch.fit import fit_fully_bayesian_model_nuts
        from botorch.models.fully_bayesian import SaasFullyBayesianSingleTaskGP
        from botorch.models.transforms.outcome import Standardize
        from botorch.optim import optimize_acqf
        from botorch.utils.transforms import normalize, unnormalize

        if train_obj.size(-1) != 1 or train_con is not None:
            raise ValueError("the saasbo sampler handles one objective without constraints")
        x = normalize(train_x, bounds=bounds)
        key = (tuple(train_x.shape), float(train_obj.sum()), float(train_x.sum()))
        if self.fitted is None or self.fitted[0] != key:
            torch.manual_seed(self.seed + train_x.shape[0])
            model = SaasFullyBayesianSingleTaskGP(x, train_obj, outcome_transform=Standardize(m=1))
            fit_fully_bayesian_model_nuts(
                model, warmup_steps=WARMUP_STEPS, num_samples=NUM_SAMPLES, thinning=THINNING, disable_progbar=True
            )
            self.fitted = (key, model)
        model = self.fitted[1]
        pending = normalize(pending_x, bounds=bounds) if pending_x is not None and len(pending_x) else None
        acqf = qLogExpectedImprovement(model=model, best_f=train_obj.max(), X_pending=pending)
        unit = torch.zeros_like(bounds)
        unit[1] = 1.0
        candidates, _ = optimize_acqf(acqf, bounds=unit, q=1, num_restarts=4, raw_samples=256)
        return unnormalize(candidates.detach(), bounds=bounds)


def saasbo_sampler(seed: int) -> Any:
    import warnings

    import optuna
    from optuna_integration import BoTorchSampler

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return BoTorchSampler(
            candidates_func=SaasCandidates(seed), n_startup_trials=10, consider_running_trials=True, seed=seed
        )
