"""The learning agent: the MDP (features, actions, reward, mask), the DQN
learner and its weights, and the online policy.
"""
