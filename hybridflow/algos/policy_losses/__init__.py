"""Policy losses; importing this package registers all of them.

Every module here is imported, so a new loss is one new file (its function, its knobs' dataclass, its spec) plus
its row in docs/algorithms.md: nothing else lists it.
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
