"""The kernel side: the library loader, the hooks into tf.data, the root
dataset and the session (every use of TensorFlow's private API lives here).
"""
