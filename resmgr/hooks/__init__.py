"""Runtime hook plugins (koordinator's RuntimeHookService), called around lifecycle calls."""

from resmgr.hooks.registry import DEFAULT_DIR, FailurePolicy, Hook, PluginSpec
from resmgr.hooks.runner import SKIP_LABEL, HookFailed, Hooks

__all__ = ["DEFAULT_DIR", "SKIP_LABEL", "FailurePolicy", "Hook", "HookFailed", "Hooks", "PluginSpec"]
