"""The learning agent: the DQN learner and its weights, the online and the
Q-ranked policies, and warm starts (the MDP is `intune_tf.tuning.mdp`).
"""
