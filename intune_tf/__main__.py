"""`python -m intune_tf ...`: the `intune` command.

No module inside the package runs as a script: a script's folder goes first
on `sys.path`, where `intune_tf/keras.py` would shadow Keras.
"""

from intune_tf import cli

cli.run()
