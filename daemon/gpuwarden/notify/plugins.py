"""Loading only the apprise plugins the config names, and loading them before they are needed.

apprise's first use imports every one of its ~190 plugin modules: a fifth of a second and
about 23 MiB of RSS, paid by the first message of a daemon's life (and the 60 MiB budget).
``load_plugins`` registers just the modules behind the URLs' schemes with apprise's plugin
manager instead (about 9 MiB for ``json://``); a scheme not in ``PLUGIN_MODULES`` falls back
to apprise's own full load, so every URL apprise knows still works. ``warm`` runs once in the
sender's thread after the daemon is ready: it loads those modules and builds each URL's plugin
object (sending nothing), so the first incident's message goes out as fast as the hundredth.

This touches apprise's manager internals (``_module_map``, ``_schema_map``, ``_loaded``);
apprise is pinned to 2.x and ``tests/test_notify_plugins.py`` checks every entry of the table
against the installed apprise.
"""

from __future__ import annotations

import importlib
import threading
import urllib.parse
from collections.abc import Iterable
from typing import Any

# URL scheme -> the apprise plugin module (apprise/plugins/<name>.py) that serves it.
PLUGIN_MODULES: dict[str, str] = {
    "json": "custom_json",
    "jsons": "custom_json",
    "form": "custom_form",
    "forms": "custom_form",
    "xml": "custom_xml",
    "xmls": "custom_xml",
    "ntfy": "ntfy",
    "ntfys": "ntfy",
    "mailto": "email",
    "mailtos": "email",
    "slack": "slack",
    "discord": "discord",
    "tgram": "telegram",
    "pover": "pushover",
    "pagerduty": "pagerduty",
    "opsgenie": "opsgenie",
    "matrix": "matrix",
    "matrixs": "matrix",
    "mmost": "mattermost",
    "mmosts": "mattermost",
    "rocket": "rocketchat",
    "rockets": "rocketchat",
    "gotify": "gotify",
    "gotifys": "gotify",
    "signal": "signal_api",
    "signals": "signal_api",
    "workflow": "workflows",
    "workflows": "workflows",
    "apprise": "apprise_api",
    "apprises": "apprise_api",
    "zulip": "zulip",
    "webex": "webexteams",
    "wxteams": "webexteams",
    "splunk": "splunk",
    "victorops": "splunk",
}

_SELECTED = "gpuwarden:selected-plugins"  # marks apprise's manager as set up by us
_lock = threading.Lock()


def scheme_of(url: str) -> str:
    try:
        return urllib.parse.urlsplit(url.strip()).scheme.lower()
    except ValueError:
        return ""


def load_plugins(urls: Iterable[str]) -> tuple[str, ...]:
    """Make apprise able to parse ``urls`` while importing as few plugin modules as it can;
    returns the plugin modules registered so far (all of them after a full load: ``("*",)``).
    Idempotent and thread-safe."""
    from apprise.plugins import N_MGR as manager  # here: importing apprise costs ~4 MiB

    N_MGR: Any = manager

    with _lock:
        if N_MGR and _SELECTED not in N_MGR._loaded:
            return ("*",)  # apprise loaded everything already (doctor, notify-test)
        wanted = {scheme_of(url) for url in urls}
        if any(s not in PLUGIN_MODULES for s in wanted):
            N_MGR._loaded.discard(_SELECTED)
            N_MGR.load_modules()  # every plugin, skipping the ones registered already
            return ("*",)
        with N_MGR._lock:  # apprise's own (not reentrant): held for the map writes only
            if not N_MGR:
                N_MGR._module_map = {}
                N_MGR._schema_map = {}
                N_MGR._custom_module_map = {}
                N_MGR._loaded.add(_SELECTED)
            for scheme in sorted(wanted):
                _register(N_MGR, PLUGIN_MODULES[scheme])
            return tuple(sorted(N_MGR._module_map))


def _register(manager: Any, module_name: str) -> None:
    """Import one plugin module and map its schemes, as apprise's own loader does."""
    if module_name in manager._module_map:
        return
    path = f"{manager.module_name_prefix}.{module_name}"
    module = importlib.import_module(path)
    for attribute in dir(module):
        plugin = getattr(module, attribute)
        if not manager.module_filter_re.match(attribute) or not hasattr(plugin, "app_id"):
            continue
        manager._module_map[module_name] = {
            "plugin": {plugin},
            "module": module,
            "path": path,
            "native": True,
        }
        schemes = plugin.schemas(plugin) if callable(getattr(plugin, "schemas", None)) else set()
        for scheme in schemes:
            manager._schema_map.setdefault(scheme, plugin)
        return


def warm(urls: Iterable[str]) -> tuple[str, ...]:
    """Load the plugins of ``urls`` and build each URL's plugin object once (nothing is sent,
    nothing is kept): apprise, its plugin modules and what they import are in memory before
    the first message. Returns the plugin modules loaded."""
    import apprise

    listed = list(urls)
    loaded = load_plugins(listed)
    probe = apprise.Apprise()
    for url in listed:
        probe.add(url)
    probe.clear()
    return loaded
