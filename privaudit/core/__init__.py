"""The vocabulary every other layer speaks: errors, limits and the config schema, the run's
configuration, messages and the network that carries them, threat models and their views,
observations, parameter layouts, Poisson sampling, the engine's Context and State, privacy
facts and their accounting (σ ↔ ε), and strict file writes. Imports nothing above itself."""
