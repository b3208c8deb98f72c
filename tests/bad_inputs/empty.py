# expect: S2S003 1:1
