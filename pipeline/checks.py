"""Checks at the edge, shared by every command: a config value of the right kind and range, a folder that can
be written, a service that answers. Each failure is a `ConfigError` naming the setting and how to fix it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError


def positive_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"`{key} >= 1` (whole number) must hold, got {key}={value!r}: set {key}=N on the command line"
        )
    return value


def whole_number(value: Any, key: str) -> int:
    """`value` as a whole number >= 0; ConfigError names `key` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{key} must be a whole number >= 0, got {key}={value!r}")
    return value


def optional_positive(value: Any, key: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"`{key} > 0` must hold (or null for no cap), got {key}={value!r}")
    return float(value)


def optional_positive_int(value: Any, key: str) -> int | None:
    """`value` as a whole number >= 1, or None (null: no cap); ConfigError names `key` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"`{key} >= 1` (a whole number, or null for no cap) must hold, got {key}={value!r}")
    return value


def fraction(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ConfigError(f"`0 <= {key} < 1` must hold, got {key}={value!r}")
    return float(value)


def boolean(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {key}={value!r}")
    return value


def one_of(value: Any, key: str, choices: tuple[str, ...]) -> str:
    """One of `choices`."""
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(f"{key} must be one of {list(choices)}, got {key}={value!r}")
    return value


def number(value: Any, key: str, low: float | None = None, high: float | None = None) -> float:
    """A finite number within [low, high] (either bound optional)."""
    ok = (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and value == value
        and abs(value) != float("inf")
    )
    if ok and low is not None:
        ok = value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        bounds = " and ".join(b for b in (low is not None and f">= {low:g}", high is not None and f"<= {high:g}") if b)
        raise ConfigError(f"{key} must be a number{f' {bounds}' if bounds else ''}, got {key}={value!r}")
    return float(value)


CONNECT_TIMEOUT_S = 5.0  # a service that has not answered by then is reported, not waited for


def check_answers(key: str, value: str, host: str, port: int, what: str, fix: str) -> None:
    """ConfigError unless something accepts a TCP connection at host:port within CONNECT_TIMEOUT_S."""
    import socket

    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise ConfigError(f"{key}={value}: no {what} answers at {host}:{port} ({err.strerror or err}): {fix}") from None


def make_dir(path: Path, key: str, value: object) -> None:
    """mkdir -p, or a ConfigError naming the setting that chose the folder."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(
            f"{key}={value}: cannot create the folder {path} ({err.strerror}): set {key} to a folder you can write"
        ) from None
