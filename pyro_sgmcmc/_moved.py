"""Former module paths: ``pyro_sgmcmc.export`` and the like still import, as the moved module.

The package's modules now live in folders by job (:mod:`pyro_sgmcmc.models`,
:mod:`pyro_sgmcmc.inference`, :mod:`pyro_sgmcmc.variational`, :mod:`pyro_sgmcmc.analysis`,
:mod:`pyro_sgmcmc.data`, :mod:`pyro_sgmcmc.cli`). Code written against the former flat layout
(``from pyro_sgmcmc.export import to_inference_data``, ``import pyro_sgmcmc.diagnostics``) keeps
working: :class:`FormerPathFinder`, installed on ``sys.meta_path`` by the package, answers a
former name with the module object of its new home. It is the same object, not a copy, so
attributes set on one (e.g. by ``monkeypatch``) are seen through the other, and pickles and
checkpoint files that name a former path load.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

#: Former module name (under ``pyro_sgmcmc.``) -> where the module lives now.
FORMER_PATHS: dict[str, str] = {
    "model_structure": "models.structure",
    "potentials": "models.potentials",
    "potential_choice": "models.potential_choice",
    "functional_potential": "models.functional_potential",
    "graph_capture": "models.graph_capture",
    "initialization": "models.initialization",
    "gibbs": "models.gibbs",
    "conjugate": "models.conjugate",
    "vectorized": "inference.vectorized",
    "checkpoint": "inference.checkpoint",
    "checkpoint_files": "inference.checkpoint_files",
    "schedules": "inference.schedules",
    "svi": "variational.svi",
    "svi_checks": "variational.svi_checks",
    "svi_fit": "variational.svi_fit",
    "svi_loss": "variational.svi_loss",
    "svi_prior": "variational.svi_prior",
    "svi_result": "variational.svi_result",
    "svi_store": "variational.svi_store",
    "flipout": "variational.flipout",
    "flipout_estimators": "variational.flipout_estimators",
    "flipout_mlp": "variational.flipout_mlp",
    "flipout_modules": "variational.flipout_modules",
    "pruning": "variational.pruning",
    "export": "analysis.export",
    "export_checks": "analysis.export_checks",
    "export_groups": "analysis.export_groups",
    "export_hmc_stats": "analysis.export_hmc_stats",
    "export_sources": "analysis.export_sources",
    "export_trace": "analysis.export_trace",
    "export_xarray": "analysis.export_xarray",
    "_arviz": "analysis._arviz",
    "diagnostics": "analysis.diagnostics",
    "function_space": "analysis.function_space",
    "metrics": "analysis.metrics",
    "predictive": "analysis.predictive",
    "plots": "analysis.plots",
    "datasets": "data.datasets",
    "datasets_base": "data.datasets_base",
    "datasets_builtin": "data.datasets_builtin",
    "datasets_table": "data.datasets_table",
    "datasets_targets": "data.datasets_targets",
    "compare": "cli.compare",
    "compare_config": "cli.compare_config",
    "compare_fit": "cli.compare_fit",
    "compare_method": "cli.compare_method",
    "compare_output": "cli.compare_output",
    "compare_results": "cli.compare_results",
}


class FormerPathFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Import ``pyro_sgmcmc.<former>`` as the module now at :data:`FORMER_PATHS`'s path."""

    prefix = "pyro_sgmcmc."

    def find_spec(self, fullname: str, path: object = None, target: object = None):
        """A spec for a former path (loaded by this finder), else ``None``."""
        former = fullname.removeprefix(self.prefix)
        if fullname.startswith(self.prefix) and former in FORMER_PATHS:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        """The moved module itself (imported first if need be)."""
        module = importlib.import_module(
            self.prefix + FORMER_PATHS[spec.name.removeprefix(self.prefix)]
        )
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run (the module ran under its new name); give it its own spec back.

        The import system sets ``__spec__`` on whatever :meth:`create_module` returns; the
        moved module keeps the spec of its real path, so ``importlib.reload`` and tools that read
        ``__spec__.name`` see where it lives.
        """
        if module.__spec__ is not None and module.__spec__.loader is self:
            module.__spec__ = module.__spec__.loader_state


def install() -> None:
    """Put one :class:`FormerPathFinder` on ``sys.meta_path`` (again: no-op); done on import."""
    if not any(isinstance(finder, FormerPathFinder) for finder in sys.meta_path):
        sys.meta_path.append(FormerPathFinder())


install()
