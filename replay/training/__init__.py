"""The science: deterministic training in float64 rounded to float32 with logged close calls, its ops, the bundled architectures and data, the native CPU kernel."""
