"""Every image of the HTML book is a link to its own file, so a reader can open a figure full size.

Sphinx links an image to its file only when the image was scaled (``html_scaled_image_link``:
an image with a width, height or scale option). A notebook's figures carry none, and on a
phone a figure is drawn smaller than its file. After Sphinx has picked each image's file and
linked the scaled ones, this extension links the others the same way (class
``mha-figure-link``, where book.css and book.js set how a wide figure scrolls). Images already
inside a link, and images from elsewhere (an address with a scheme), are left alone. The
one-page build of the PDF keeps its images unlinked: a link to a file means nothing on paper.
"""

from __future__ import annotations

import posixpath

from docutils import nodes
from sphinx.application import Sphinx


def _link_images(builder, doctree: nodes.document) -> None:
    for image in list(doctree.findall(nodes.image)):
        uri = image["uri"]
        if isinstance(image.parent, nodes.reference) or "://" in uri or uri.startswith("data:"):
            continue
        reference = nodes.reference("", "", internal=True, classes=["mha-figure-link"],
                                    reftitle="Open the figure at full size")
        reference["refuri"] = (posixpath.join(builder.imgpath, builder.images[uri])
                               if uri in builder.images else uri)
        image.replace_self(reference)
        reference.append(image)


def _wrap_post_process_images(app: Sphinx) -> None:
    builder = app.builder
    if builder.name != "html":
        return
    sphinx_post_process = builder.post_process_images

    def post_process_images(doctree: nodes.document) -> None:
        sphinx_post_process(doctree)
        _link_images(builder, doctree)

    builder.post_process_images = post_process_images


def setup(app: Sphinx) -> dict:
    app.connect("builder-inited", _wrap_post_process_images)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
