"""Thirty HumanEval-style problems written for the code-verifier benchmark: (entry point, canonical
solution, ``check(candidate)`` tests). Wrong stubs are ``return None`` bodies made by the benchmark."""

from __future__ import annotations

PROBLEMS: list[tuple[str, str, str]] = [
    (
        "add",
        "def add(a, b):\n    return a + b\n",
        "assert candidate(1, 2) == 3\nassert candidate(-5, 5) == 0\nassert candidate(10**20, 1) == 10**20 + 1",
    ),
    (
        "is_palindrome",
        "def is_palindrome(s):\n    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]\n",
        "assert candidate('A man, a plan, a canal: Panama') is True\nassert candidate('abc') is False\nassert candidate('') is True",
    ),
    (
        "fizzbuzz",
        "def fizzbuzz(n):\n    return ['FizzBuzz' if i % 15 == 0 else 'Fizz' if i % 3 == 0 else 'Buzz' if i % 5 == 0 else str(i) for i in range(1, n + 1)]\n",
        "assert candidate(5) == ['1', '2', 'Fizz', '4', 'Buzz']\nassert candidate(15)[-1] == 'FizzBuzz'\nassert candidate(0) == []",
    ),
    (
        "running_max",
        "def running_max(xs):\n    out, best = [], None\n    for x in xs:\n        best = x if best is None or x > best else best\n        out.append(best)\n    return out\n",
        "assert candidate([1, 3, 2, 5, 4]) == [1, 3, 3, 5, 5]\nassert candidate([]) == []\nassert candidate([-1, -2]) == [-1, -1]",
    ),
    (
        "count_vowels",
        "def count_vowels(s):\n    return sum(c in 'aeiouAEIOU' for c in s)\n",
        "assert candidate('hello') == 2\nassert candidate('xyz') == 0\nassert candidate('AEIOU aeiou') == 10",
    ),
    (
        "gcd",
        "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return abs(a)\n",
        "assert candidate(12, 18) == 6\nassert candidate(17, 5) == 1\nassert candidate(0, 9) == 9\nassert candidate(-4, 6) == 2",
    ),
    (
        "is_prime",
        "def is_prime(n):\n    if n < 2:\n        return False\n    i = 2\n    while i * i <= n:\n        if n % i == 0:\n            return False\n        i += 1\n    return True\n",
        "assert [x for x in range(20) if candidate(x)] == [2, 3, 5, 7, 11, 13, 17, 19]\nassert candidate(7919)\nassert not candidate(7917)",
    ),
    (
        "flatten",
        "def flatten(xs):\n    out = []\n    for x in xs:\n        out.extend(flatten(x) if isinstance(x, list) else [x])\n    return out\n",
        "assert candidate([1, [2, [3, [4]]], 5]) == [1, 2, 3, 4, 5]\nassert candidate([]) == []\nassert candidate([[[]]]) == []",
    ),
    (
        "word_freq",
        "def word_freq(text):\n    counts = {}\n    for w in text.lower().split():\n        counts[w] = counts.get(w, 0) + 1\n    return counts\n",
        "assert candidate('a b A c b a') == {'a': 3, 'b': 2, 'c': 1}\nassert candidate('') == {}",
    ),
    (
        "rotate",
        "def rotate(xs, k):\n    if not xs:\n        return []\n    k %= len(xs)\n    return xs[-k:] + xs[:-k] if k else list(xs)\n",
        "assert candidate([1, 2, 3, 4, 5], 2) == [4, 5, 1, 2, 3]\nassert candidate([1, 2], 4) == [1, 2]\nassert candidate([], 3) == []",
    ),
    (
        "two_sum",
        "def two_sum(nums, target):\n    seen = {}\n    for i, x in enumerate(nums):\n        if target - x in seen:\n            return (seen[target - x], i)\n        seen[x] = i\n    return None\n",
        "assert candidate([2, 7, 11, 15], 9) == (0, 1)\nassert candidate([3, 2, 4], 6) == (1, 2)\nassert candidate([1, 2], 7) is None",
    ),
    (
        "roman",
        "def roman(n):\n    vals = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'), (50, 'L'), (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')]\n    out = ''\n    for v, s in vals:\n        while n >= v:\n            out += s\n            n -= v\n    return out\n",
        "assert candidate(1994) == 'MCMXCIV'\nassert candidate(4) == 'IV'\nassert candidate(3999) == 'MMMCMXCIX'",
    ),
    (
        "balanced",
        "def balanced(s):\n    pairs, stack = {')': '(', ']': '[', '}': '{'}, []\n    for c in s:\n        if c in '([{':\n            stack.append(c)\n        elif c in pairs:\n            if not stack or stack.pop() != pairs[c]:\n                return False\n    return not stack\n",
        "assert candidate('([]{})')\nassert not candidate('(]')\nassert not candidate('((')\nassert candidate('')",
    ),
    (
        "fib",
        "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
        "assert [candidate(i) for i in range(10)] == [0, 1, 1, 2, 3, 5, 8, 13, 21, 34]\nassert candidate(90) == 2880067194370816120",
    ),
    (
        "dedupe",
        "def dedupe(xs):\n    seen, out = set(), []\n    for x in xs:\n        if x not in seen:\n            seen.add(x)\n            out.append(x)\n    return out\n",
        "assert candidate([3, 1, 3, 2, 1]) == [3, 1, 2]\nassert candidate([]) == []\nassert candidate(['a', 'a']) == ['a']",
    ),
    (
        "chunks",
        "def chunks(xs, n):\n    return [xs[i:i + n] for i in range(0, len(xs), n)]\n",
        "assert candidate([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]\nassert candidate([], 3) == []",
    ),
    (
        "caesar",
        "def caesar(s, k):\n    out = []\n    for c in s:\n        if c.isalpha():\n            base = ord('a') if c.islower() else ord('A')\n            out.append(chr((ord(c) - base + k) % 26 + base))\n        else:\n            out.append(c)\n    return ''.join(out)\n",
        "assert candidate('abc xyz', 3) == 'def abc'\nassert candidate('Hello!', 13) == 'Uryyb!'\nassert candidate('a', -1) == 'z'",
    ),
    (
        "median",
        "def median(xs):\n    s = sorted(xs)\n    n = len(s)\n    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2\n",
        "assert candidate([3, 1, 2]) == 2\nassert candidate([4, 1, 2, 3]) == 2.5\nassert candidate([5]) == 5",
    ),
    (
        "anagrams",
        "def anagrams(a, b):\n    return sorted(a.replace(' ', '').lower()) == sorted(b.replace(' ', '').lower())\n",
        "assert candidate('Listen', 'Silent')\nassert not candidate('abc', 'abd')\nassert candidate('a gentleman', 'elegant man')",
    ),
    (
        "digits_sum",
        "def digits_sum(n):\n    return sum(int(d) for d in str(abs(n)))\n",
        "assert candidate(1234) == 10\nassert candidate(-99) == 18\nassert candidate(0) == 0",
    ),
    (
        "transpose",
        "def transpose(m):\n    return [list(row) for row in zip(*m)]\n",
        "assert candidate([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]\nassert candidate([]) == []",
    ),
    (
        "binary_search",
        "def binary_search(xs, x):\n    lo, hi = 0, len(xs)\n    while lo < hi:\n        mid = (lo + hi) // 2\n        if xs[mid] < x:\n            lo = mid + 1\n        else:\n            hi = mid\n    return lo if lo < len(xs) and xs[lo] == x else -1\n",
        "assert candidate([1, 3, 5, 7], 5) == 2\nassert candidate([1, 3, 5, 7], 4) == -1\nassert candidate([], 1) == -1",
    ),
    (
        "compress",
        "def compress(s):\n    out, i = [], 0\n    while i < len(s):\n        j = i\n        while j < len(s) and s[j] == s[i]:\n            j += 1\n        out.append(f'{s[i]}{j - i}')\n        i = j\n    return ''.join(out)\n",
        "assert candidate('aaabcc') == 'a3b1c2'\nassert candidate('') == ''\nassert candidate('z') == 'z1'",
    ),
    (
        "pascal_row",
        "def pascal_row(n):\n    row = [1]\n    for _ in range(n):\n        row = [a + b for a, b in zip([0] + row, row + [0])]\n    return row\n",
        "assert candidate(0) == [1]\nassert candidate(4) == [1, 4, 6, 4, 1]",
    ),
    (
        "intersect",
        "def intersect(a, b):\n    return sorted(set(a) & set(b))\n",
        "assert candidate([1, 2, 2, 3], [2, 3, 4]) == [2, 3]\nassert candidate([], [1]) == []",
    ),
    (
        "title_case",
        "def title_case(s):\n    return ' '.join(w[:1].upper() + w[1:].lower() for w in s.split(' '))\n",
        "assert candidate('hello wORLD') == 'Hello World'\nassert candidate('') == ''",
    ),
    (
        "max_subarray",
        "def max_subarray(xs):\n    best = cur = xs[0]\n    for x in xs[1:]:\n        cur = max(x, cur + x)\n        best = max(best, cur)\n    return best\n",
        "assert candidate([-2, 1, -3, 4, -1, 2, 1, -5, 4]) == 6\nassert candidate([-3, -1]) == -1",
    ),
    (
        "parse_kv",
        "def parse_kv(s):\n    return {k.strip(): v.strip() for k, v in (p.split('=', 1) for p in s.split(';') if '=' in p)}\n",
        "assert candidate('a=1; b = 2;c') == {'a': '1', 'b': '2'}\nassert candidate('') == {}",
    ),
    (
        "merge_sorted",
        "def merge_sorted(a, b):\n    out, i, j = [], 0, 0\n    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n        else:\n            out.append(b[j]); j += 1\n    return out + a[i:] + b[j:]\n",
        "assert candidate([1, 4, 9], [2, 3, 10]) == [1, 2, 3, 4, 9, 10]\nassert candidate([], [1]) == [1]",
    ),
    (
        "char_histogram",
        "def char_histogram(s):\n    return {c: s.count(c) for c in set(s) if c != ' '}\n",
        "assert candidate('a b b') == {'a': 1, 'b': 2}\nassert candidate('') == {}\nassert candidate('   ') == {}",
    ),
]


def check_source(tests: str) -> str:
    """The problem's tests as a HumanEval ``check(candidate)`` function."""
    return "def check(candidate):\n" + "".join(f"    {line}\n" for line in tests.splitlines())


def stub(entry_point: str, solution: str) -> str:
    """The wrong answer: the solution's signature with a ``return None`` body."""
    header = next(line for line in solution.splitlines() if line.startswith(f"def {entry_point}("))
    return f"{header}\n    return None\n"
