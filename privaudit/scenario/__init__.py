"""What a run is set in: datasets and their partition over agents, models, communication
graphs and mixing matrices, and the searched operating points (presets)."""
