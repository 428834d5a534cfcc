"""The kernel side: the library loader and the tuning session (the uses of
TensorFlow's private API outside the hooks into tf.data, `intune_tf.tfdata`).
"""
