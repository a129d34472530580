"""Entry point of ``frenzy-client``: the only place that maps errors to exit codes."""

from __future__ import annotations

import sys

from frenzy_client.cli import run_cli


def main() -> None:
    sys.exit(run_cli(sys.argv[1:]))


if __name__ == "__main__":
    main()
