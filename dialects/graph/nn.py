"""TODO"""

OPS: list = []
