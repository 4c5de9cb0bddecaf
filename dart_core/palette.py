"""The colour palette every figure draws with (the page's and the benchmark report's).

Okabe-Ito: eight colours that stay distinguishable with the common colour-vision deficiencies, plus grey.
It lives here, below both the page (``ui``) and the benchmark (``bench``), so neither imports the other.
"""
OKABE_ITO = {
    "black": "#000000", "orange": "#E69F00", "sky_blue": "#56B4E9", "bluish_green": "#009E73",
    "yellow": "#F0E442", "blue": "#0072B2", "vermillion": "#D55E00", "reddish_purple": "#CC79A7",
    "grey": "#999999",
}
