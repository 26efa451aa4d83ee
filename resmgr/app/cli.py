"""cri-resmgr command line: the subcommands, and the daemon (resmgr/app/launch.py).

Only what every subcommand needs is imported here, so `cri-resmgr status --probe`, run by probes
every few seconds, does not load the engine.
"""

from __future__ import annotations

import argparse
import sys

from resmgr import __version__
from resmgr.app.options import Options
from resmgr.options import add_to

DESCRIPTION = """\
CRI resource manager: a CRI relay between kubelet and the container runtime.
Point kubelet's --container-runtime-endpoint at the relay socket; pod and container
lifecycle calls are handed to the active policy and to the runtime hook plugins
registered in the hook directory, everything else passes through. It accepts
koord-runtime-proxy's flags, so it can take that binary's place on a node.

With --nri it runs instead as an NRI plugin inside the runtime (containerd >= 1.7,
CRI-O >= 1.26 with NRI enabled): no kubelet reconfiguration, the same policies, state
and hook plugins.

`cri-resmgr simulate --help` runs a policy over a list of pods without a runtime;
`cri-resmgr status --help` shows what a running relay has in force."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cri-resmgr", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_to(p, Options)
    p.add_argument("--version", action="version", version=f"cri-resmgr {__version__}")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["simulate"]:
        from resmgr.app import simulate

        return simulate.main(argv[1:])
    if argv[:1] == ["status"]:
        from resmgr.app import status

        return status.main(argv[1:])
    from resmgr.app import launch

    return launch.main(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
