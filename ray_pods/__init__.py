"""Python that runs inside the Ray pods, not in the CDK app.

The stack ships this package's files to every Ray pod in a ConfigMap mounted as a
whole directory on PYTHONPATH (serve_config/endpoint_keys.py), so Ray imports it
by name with no image build. Only the standard library, Ray and what Ray Serve LLM
already imports (FastAPI, Starlette) may be used here: the pods have nothing else.
"""
