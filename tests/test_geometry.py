"""pixrl.pix.geometry: area, convergence, cut, winding, orientation, errors, hashing (foundation area)."""
import math

import numpy as np
import pytest

from pixrl.pix.geometry import (API_REGISTRY, MATH_NAMES, SAFE_BUILTINS, Grid, RenderError, Scene,
                            allowed_names, check_footprint, drawing_namespace, mask_sha256, rasterize,
                            render)


@pytest.mark.parametrize("fp,shape", [((50, 20), (128, 128)), ((7.5, 90), (64, 64)), ((3, 3), (128, 32))])
def test_rect_area_within_boundary_band(fp, shape):
    W, H = fp
    x, y, w, h = 0.13 * W, 0.21 * H, 0.5 * W, 0.37 * H
    m = render(f"rect({x!r}, {y!r}, {w!r}, {h!r})", fp, shape)
    sx, sy = W / shape[1], H / shape[0]
    band = 2 * (w * sy + h * sx) + 4 * sx * sy
    assert abs(m.sum() * sx * sy - w * h) <= band


def test_circle_area_converges_to_pi_r2():
    errs = []
    for n in (16, 64, 256, 1024):
        m = render("circle(10, 10, 7)", (20, 20), (n, n))
        errs.append(abs(m.sum() * (20 / n) ** 2 - math.pi * 49) / (math.pi * 49))
    assert errs[-1] < 0.001 and errs[-1] < errs[1] < errs[0]


def test_ring_is_disc_minus_disc():
    fp, s = (40, 40), (128, 128)
    ring = render("ring(20, 20, 10, 4)", fp, s)
    outer, inner = render("circle(20, 20, 12)", fp, s), render("circle(20, 20, 8)", fp, s)
    # ring's inner boundary is closed (d >= 8), the disc's is closed too: they differ only on d == 8
    assert (ring == (outer & ~inner)).mean() > 0.995 and not (ring & ~outer).any()


def test_cut_removes_exactly_and_later_draws_add_back():
    fp, s = (30, 20), (96, 64)
    pad = render("rect(1, 1, 28, 18)", fp, s)
    holes = render("for i in range(4):\n    circle(5 + i*7, 10, 2.5)", fp, s)
    cut = render("rect(1, 1, 28, 18)\nfor i in range(4):\n    cut(circle(5 + i*7, 10, 2.5))", fp, s)
    assert np.array_equal(cut, pad & ~holes)
    redraw = render("rect(1, 1, 28, 18)\ncut(rect(5, 5, 10, 10))\nrect(8, 8, 2, 2)", fp, s)
    assert np.array_equal(redraw, (pad & ~render("rect(5, 5, 10, 10)", fp, s)) | render("rect(8, 8, 2, 2)", fp, s))
    # a cut only affects material drawn before it
    assert np.array_equal(render("cut(rect(5, 5, 10, 10))\nrect(1, 1, 28, 18)", fp, s), pad)
    # cutting a named shape later: the shape stops adding, the cut applies where cut() is called
    named = render("h = circle(15, 10, 3)\nrect(1, 1, 28, 18)\ncut(h)", fp, s)
    assert np.array_equal(named, pad & ~render("circle(15, 10, 3)", fp, s))


def test_polygon_winding_either_orientation_and_holes():
    fp, s = (10, 10), (40, 40)
    ccw = render("polygon([(2, 2), (8, 2), (8, 8), (2, 8)])", fp, s)
    cw = render("polygon([(2, 2), (2, 8), (8, 8), (8, 2)])", fp, s)
    assert np.array_equal(ccw, cw) and ccw.sum() == 24 * 24
    # winding 2 (the square traced twice) fills once; a reversed inner loop (winding 0) is a hole
    twice = render("polygon([(2, 2), (8, 2), (8, 8), (2, 8)] * 2)", fp, s)
    assert np.array_equal(twice, ccw)
    holed = render("polygon([(1, 1), (9, 1), (9, 9), (1, 9), (1, 1), (3, 3), (3, 7), (7, 7), (7, 3), (3, 3)])", fp, s)
    assert holed.sum() == 32 * 32 - 16 * 16
    # same-orientation inner loop: winding 2 inside -> filled (non-zero rule, not even-odd)
    nz = render("polygon([(1, 1), (9, 1), (9, 9), (1, 9), (1, 1), (3, 3), (7, 3), (7, 7), (3, 7), (3, 3)])", fp, s)
    assert nz.sum() == 32 * 32


def test_y_up_orientation():
    m = render("rect(0, 0, 20, 3)", (20, 30), (30, 20))  # bottom strip
    assert m[-3:].all() and not m[:-3].any()
    m = render("rect(0, 27, 20, 3)", (20, 30), (30, 20))  # top strip
    assert m[:3].all() and not m[3:].any()
    m = render("rect(0, 0, 4, 30)", (20, 30), (30, 20))  # left strip
    assert m[:, :4].all() and not m[:, 4:].any()
    g = Grid((20, 30), (30, 20))
    assert g.ys[0] > g.ys[-1] and g.xs[0] < g.xs[-1] and g.scale_um == (1.0, 1.0)


def test_path_manhattan_equals_rect_union():
    a = render("path([(2, 2), (2, 18), (18, 18), (18, 6)], 2)", (20, 20), (80, 80))
    b = render("rect(1, 1, 2, 18)\nrect(1, 17, 18, 2)\nrect(17, 5, 2, 14)", (20, 20), (80, 80))
    assert np.array_equal(a, b)


def test_window_superset_matches_full_grid_evaluation():
    # the bbox window is an optimisation only: compare against an unwindowed evaluation
    rng = np.random.default_rng(0)
    grid = Grid((37.5, 12.25), (128, 128))
    X, Y = grid.xs[None, :], grid.ys[:, None]
    for _ in range(50):
        cx, cy = rng.uniform(-5, 40), rng.uniform(-5, 15)
        src = f"circle({cx!r}, {cy!r}, {rng.uniform(0, 8)!r})\nring({cy!r}, {cx!r}, 3.0, 1.5)"
        scene = Scene()
        exec(src, drawing_namespace(scene))
        full = np.zeros(grid.shape, bool)
        for op, shape in scene.ops:
            full |= shape.inside(X, Y)
        assert np.array_equal(rasterize(scene, grid), full)


def test_golden_hashes_are_platform_independent():
    # pinned digests: if these change, the sealed dataset digests change too
    src = ("rect(1.25, 2.5, 30, 4.75)\nfor i in range(5):\n    circle(4 + i*6.5, 12, 1.75)\n"
           "ring(20, 20, 6, 1.5)\npolygon([(0, 30), (12, 26), (12, 34)])\n"
           "path([(25, 30), (38, 36)], 1.25)\ncut(rect(10, 3, 2.5, 2.5))")
    m = render(src, (40, 40), (128, 128))
    assert mask_sha256(m) == GOLDEN


GOLDEN = "cfb4a38db6eb0bc032f5dc31f345f500db0fbefeb612320f2f0ca81e60cc1b0e"


@pytest.mark.parametrize("src,needle", [
    ("rect(0, 0, -1, 2)", "w=-1"), ("circle(1, 1, float('inf'))", "r=inf"), ("rect(0, 0, 1, 1/0)", "ZeroDivisionError"),
    ("import os", "ImportError"), ("rect(0, 0", "syntax error"), ("cut(5)", "cut()"), ("polygon([(0, 0), (1, 1)])", "2 points"),
    ("path([(0, 0), (1, 'a')], 1)", "'a'"), ("rect(True, 0, 1, 1)", "True"), ("open('x')", "NameError"),
])
def test_program_errors_name_the_problem(src, needle):
    with pytest.raises(RenderError, match=None) as e:
        render(src, (10, 10), (16, 16))
    assert needle in str(e.value)


@pytest.mark.parametrize("fp", [(0, 1), (1, -2), (float("nan"), 1), (1, float("inf")), (1,), (1, 2, 3), "1x2", None])
def test_bad_footprint_named(fp):
    with pytest.raises(ValueError) as e:
        check_footprint(fp)
    assert repr(fp) in str(e.value)


def test_registry_and_whitelist():
    assert set(API_REGISTRY) == {"rect", "circle", "ring", "polygon", "path", "cut"}
    assert allowed_names() == set(API_REGISTRY) | set(SAFE_BUILTINS) | set(MATH_NAMES)
    ns = drawing_namespace(Scene())
    assert ns["__builtins__"] == {} and set(ns) - {"__builtins__"} == allowed_names()
    for e in API_REGISTRY.values():
        assert e.signature.startswith(e.name + "(") and e.doc
