"pix: a policy sees a target layout and writes a program that redraws it."
