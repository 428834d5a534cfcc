"""Tuning: the policy interface, registry and baseline policies, the
observation builder, the tuner thread, warm start and host readings.
"""
