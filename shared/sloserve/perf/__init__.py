"""Performance models: shapes, hardware, analytic cost, regression, rooflines, ground truth."""
