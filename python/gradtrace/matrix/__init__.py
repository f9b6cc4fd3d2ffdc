"""``gradtrace-matrix``: one training script run under every layout of a grid (dp, tp, pp, cp, sp, gas, ...),
each layout's gradients diffed against a reference layout's, and one report that says which layouts change
the gradients and why (docs/user/matrix.md).

``grid`` the layouts and their names, ``runs`` running a layout (the version command's launcher, or a
launcher template) or collecting trace sets captured elsewhere, ``judge`` the diff of each against the
reference, ``report`` the table (text, Markdown, JSON), ``heatmap`` the HTML page, ``expect`` the CI gate,
``command`` the command line. Nothing here imports torch.
"""
