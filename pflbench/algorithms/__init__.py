"""Built-in algorithms, one module each; importing this package registers them all."""

from importlib import import_module
from pathlib import Path

for _module in sorted(Path(__file__).parent.glob("[!_]*.py")):
    import_module(f"{__name__}.{_module.stem}")
