"""Example pipelines for warpdeck, installed as ``warpdeck.examples``.

Each module holds one stage function ``stage(xp, inp, out)`` that runs unchanged with
``xp = numpy`` or ``xp = cupy``, a plain-NumPy float64 ``reference`` for one task, a
``make_inputs`` that writes ``.npy`` inputs, and a command line to call it. Next to each
module sit two spec files, ``<name>.toml`` (reads ``data/<name>/*.npy``) and
``<name>-synthetic.toml`` (seeded inputs, no files needed).

- ``spectrogram``: Hann-windowed FFT magnitudes of a 1-D signal, frame 256, hop 128:
  (N,) float32 -> (1 + (N - 256) // 128, 129) float32.
- ``dense``: a dense layer with a softmax: (512,) float32 -> (256,) float32.
- ``conv2d``: a 5x5 Sobel-style 'valid' convolution of an image: (H, W) float32 -> (H - 4, W - 4) float32.

``classify`` is a PyTorch example instead (a torch stage with a factory, docs/torch.md): a small
CNN with seeded weights over a folder of PNG/JPEG images, (3, 64, 64) float32 -> (10,) float32
class probabilities; ``make_images`` writes the images and ``classify-images.toml`` runs it.
"""
