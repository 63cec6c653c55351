"""`--rate-limit` and `--rate-limit-resource`: Triton's rate limiter flags (docs/rate-limiter.md)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

PER_DEVICE = -1  # --rate-limit-resource without a device: every device


@dataclass(frozen=True, slots=True)
class ResourceLimit:
    """One `--rate-limit-resource=NAME:COUNT[:DEVICE]` (device PER_DEVICE when not given)."""

    name: str
    count: int
    device: int = PER_DEVICE


def add_rate_limit_flags(p: argparse.ArgumentParser) -> None:
    """The rate limiter's two flags."""
    g = p.add_argument_group("rate limiter (docs/rate-limiter.md)")
    g.add_argument(
        "--rate-limit",
        default="off",
        metavar="MODE",
        help="execution_count: instances run in priority order once the resources their instance_group's "
        "rate_limiter lists are free; off: the rate_limiter settings are ignored (off)",
    )
    g.add_argument(
        "--rate-limit-resource",
        action="append",
        default=[],
        metavar="NAME:COUNT[:DEVICE]",
        help="how many of a resource exist (per device, or on DEVICE only; global resources ignore DEVICE); "
        "repeatable. Without it a resource exists as often as the largest count an instance asks for",
    )


def rate_limit_settings(args: argparse.Namespace) -> tuple[bool, list[ResourceLimit]]:
    """(enabled, explicit resources); ValueError with Triton's message (prefixed by its `Bad option:` line)."""
    mode = str(args.rate_limit).lower()
    if mode not in ("execution_count", "off"):
        raise ValueError('Bad option: "--rate-limit".\ninvalid argument for --rate-limit')
    resources = []
    for text in args.rate_limit_resource:
        try:
            resources.append(parse_resource(text))
        except ValueError as e:
            raise ValueError(f'Bad option: "--rate-limit-resource".\n{e}') from None
    return mode == "execution_count", resources


def parse_resource(text: str) -> ResourceLimit:
    """`NAME:COUNT[:DEVICE]`; ValueError with Triton's message otherwise."""
    format_error = (
        "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or '<resource_name>:<count>'. "
        f"Got {text}"
    )
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        raise ValueError(format_error)
    return ResourceLimit(parts[0], _int(parts[1]), _int(parts[2]) if len(parts) == 3 else PER_DEVICE)


def _int(text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"Invalid option value. Got {text}") from None
    if value < 0:
        raise ValueError(f"Invalid option value. Got {text}")
    return value
