"""The package version, in one place below everything (the trainer, export and the CLI
read it without importing the package face)."""
__version__ = "0.1.0"
