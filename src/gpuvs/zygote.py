"""`python -m gpuvs.zygote`, kept for one release: images, pods and scripts that name it still work.
The module is gpuvs.trial.zygote now; run that instead."""

import runpy

if __name__ == "__main__":
    runpy.run_module("gpuvs.trial.zygote", run_name="__main__", alter_sys=True)
