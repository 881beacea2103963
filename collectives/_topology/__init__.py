"""Where ranks sit: the device mesh, nodes, and the hierarchical view."""
