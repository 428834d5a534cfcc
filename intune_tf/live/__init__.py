"""The tuner of a live process: the policy registry, the observations built
from the tuning sessions, and the tuner thread that steps the policies.
"""
