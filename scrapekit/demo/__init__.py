"""The bundled demo: a local bookshop site for the demo recipe and the tests."""
