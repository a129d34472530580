"""frenzy-client: talks to the local frenzyd and renders results; runs MARP and the simulator offline."""
