"""`tapebench bench ...`: benchmark commands that print figures (never timed tests)."""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("bench", help="print performance figures with a baseline measured in the same run")
    p.add_argument("what", choices=["ca"], help="which benchmark")
    p.set_defaults(func=lambda args: print("not built yet") or 0)
