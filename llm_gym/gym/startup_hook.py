"""Make ``gym.make("ToolUseGame-v0")`` work in an interpreter that never imported ``llm_gym``.

Gymnasium 0.26-0.29 loaded the ``gymnasium.envs`` entry point group; gymnasium 1.x dropped that
plugin hook. This module is installed as the top-level ``_llm_gym_startup`` and imported by the
``llm_gym.pth`` file at interpreter start-up. It costs one tiny import: it puts a one-shot finder
on ``sys.meta_path`` that, once ``gymnasium`` has finished importing, imports ``llm_gym`` (which
registers its environments). Nothing is imported when a program never imports gymnasium, and any
error here becomes a warning, never a failed import of gymnasium.
"""

import sys


class _GymnasiumHook:
    """A meta path finder that runs ``import llm_gym`` right after ``gymnasium`` is executed."""

    def find_spec(self, name, path=None, target=None):
        if name != "gymnasium":
            return None
        from importlib.machinery import PathFinder

        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        original = spec.loader.exec_module

        def exec_module(module):
            original(module)
            if "llm_gym" in sys.modules:  # llm_gym is importing gymnasium: it registers itself
                return
            try:
                import llm_gym  # noqa: F401  (registers the environments on import)
            except Exception as exc:  # never break gymnasium's import
                import warnings

                warnings.warn(f"llm_gym could not register its environments: {exc!r}", stacklevel=2)

        spec.loader.exec_module = exec_module
        return spec


if "gymnasium" not in sys.modules and not any(isinstance(f, _GymnasiumHook) for f in sys.meta_path):
    sys.meta_path.insert(0, _GymnasiumHook())
