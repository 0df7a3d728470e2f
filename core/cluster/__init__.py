"""Scale-out on Ray Serve (``qwen-serve ray``): an ingress serving this package's own OpenAI
layer, N engine replicas, and a request router that sends a prompt to the replica that
likely holds its prefix. Only affinity.py and view.py import nothing of Ray; the rest needs
the ``ray`` extra (``pip install 'qwen-serve[ray]'``).
"""
