"""Tuning: the policy interface and baseline policies, the MDP and the
measured searches (numpy only: no TensorFlow).
"""
