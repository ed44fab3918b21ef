"""`python PATH/TO/THIS/CHECKOUT ...`: h3bridge's command line from a checkout that no Python has
installed (a ComfyUI custom_nodes clone): this folder goes first on sys.path, so the h3bridge
package beside this file is the one that runs. `--module NAME` runs another of its entry points
(h3bridge.sim.fixture_cli is `h3-sim-model`); h3bridge/runnable.py writes these commands."""
import runpy
import sys

if len(sys.argv) > 2 and sys.argv[1] == "--module":
    module = sys.argv[2]
    del sys.argv[1:3]
    sys.argv[0] = module
    runpy.run_module(module, run_name="__main__", alter_sys=True)
else:
    from h3bridge.cli import main
    sys.exit(main())
