"""The option in tf.data: the hooks that add `experimental_intune` to
`tf.data.Options`, and the root dataset they put on a pipeline.
"""
