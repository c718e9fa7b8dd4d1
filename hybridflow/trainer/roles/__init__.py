"""Role assembly: which workers a run has, how they are built and placed, and the loop they drive."""
