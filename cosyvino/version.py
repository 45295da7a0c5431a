"""The package version: one source (pyproject reads it; ``cosyvino.__version__`` re-exports it).
A leaf module, so the CLI, the server and the backends read the version without importing the
package face."""

__version__ = "0.1.0"
