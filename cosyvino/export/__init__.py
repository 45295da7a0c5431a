"""Export side: converts our PyTorch implementation to other runtimes' formats. Imports torch;
nothing on the serving path may import this package."""
