"""`python -m gpuvs.inside`, kept for one release: images, pods and scripts that name it still work.
The module is gpuvs.trial.inside now; run that instead."""

import runpy

if __name__ == "__main__":
    runpy.run_module("gpuvs.trial.inside", run_name="__main__", alter_sys=True)
