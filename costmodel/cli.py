"""The contract every Archipelago command keeps with its user, whatever layer it lives in.

- input a user can fix (a bad file, a bad value): one line `error: <what, where, how to fix>`
  on stderr, exit code 2;
- Ctrl-C: one line saying so, exit code 130, no traceback (what finished is already on disk);
- anything else is a bug and keeps its traceback.

`pipeline.cli` builds the Hydra entry points on this; the plain ones (`python -m solvers.inner`,
`solvers.expert_placement`, `pipeline.traces`, `costmodel.reference`) call `run` directly.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn

from costmodel.catalog import CatalogError
from costmodel.specs import SpecError

USAGE_ERROR = 2
INTERRUPTED = 130


class UserError(ValueError):
    """Input a user can fix; the message says what, where and how."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse under the contract: a bad command line is one `error:` line with the usage in it, exit 2
    (argparse's own prints its usage block over several lines)."""

    def error(self, message: str) -> NoReturn:
        fail(f"{message} (usage: {' '.join(self.format_usage().split()).removeprefix('usage: ')})")


def fail(message: str) -> NoReturn:
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
    sys.exit(USAGE_ERROR)


def interrupted(what: str = "") -> NoReturn:
    print(f"interrupted{f': {what}' if what else ''}", file=sys.stderr, flush=True)
    sys.exit(INTERRUPTED)


def run(main: Callable[[], int | None], errors: tuple[type[BaseException], ...] = ()) -> NoReturn:
    """Run a command's `main` under the contract above and exit with its code."""
    try:
        code = main()
    except KeyboardInterrupt:
        interrupted()
    except (UserError, CatalogError, SpecError, *errors) as err:
        fail(str(err))
    sys.exit(code or 0)
