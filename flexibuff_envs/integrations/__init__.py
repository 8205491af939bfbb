"""Bridges to the libraries people train with, each imported only when its module is
(``flexibuff_envs.integrations.sb3`` needs ``pip install -e '.[sb3]'``).

Imports: `recording` and below, and each its library.
"""
