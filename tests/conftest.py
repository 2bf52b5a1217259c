from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
REFERENCE_CSV = SHARED / "reference" / "shallowsim_reference.csv"


@pytest.fixture(scope="session")
def reference_csv() -> Path:
    if not REFERENCE_CSV.is_file():
        pytest.skip(f"{REFERENCE_CSV} not present (needs ../shared beside the checkout)")
    return REFERENCE_CSV
