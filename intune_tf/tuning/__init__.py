"""Tuning: the policy interface, registry and baseline policies, the observer,
the tuner thread, warm start and host readings.
"""
