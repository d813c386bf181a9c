"""privaudit: attack and audit privacy in decentralized, differentially private learning.

Data flows one way: defenses → messages → threat view → observation → attack → eval.
"""

__version__ = "0.1.0"
