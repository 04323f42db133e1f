"""gpuwarden: an incident-response daemon for GPU servers."""

__version__ = "0.1.0.dev0"
