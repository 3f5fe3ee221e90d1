"""The entry points: what each command does, as library calls (train: runner.py, torchrun:
launch.py, export, generate, a saved run read back, env). commands/ parses; these run."""
