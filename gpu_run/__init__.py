"""The GPU half of the suite, ready to run in one command on a machine with a GPU (docs/gpu.md).

`plan` lists the stages and their budgets, `wheels` prepares the wheelhouse (here, with network) and installs from
it (there, offline), `runner` runs the stages and writes the logs, JSON and summary; `python -m gpu_run` is the
command. Standard library only: it runs on the GPU machine's Python before anything is installed.
"""
