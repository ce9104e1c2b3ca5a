"""The hardware catalog, efficiency profiles, the device the physics sees and fitted device rates."""
