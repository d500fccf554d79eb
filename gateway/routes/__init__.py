"""HTTP routes: they orchestrate, the work lives in the modules they call."""
