"""frenzyd: the Frenzy pool daemon and its pure core (MARP, HAS, simulator, wire, auth, election)."""

__version__ = "0.1.0"
