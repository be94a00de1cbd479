"""Compact step-by-step arithmetic for the analysis channel (beam-nano v2). Pure Python 3.

Every step is short and digit by digit, lowest digit first, so a small model can carry it out and the
reasoning for easy cases stays one line:
  add       7+2=9, 6+9=15 c1, 5+8+1=14 c1, 4+0+1=5, so 5459
  subtract  7-2=5, 6-9 b 16-9=7, 5-1-8 b 14-8=6, 4-1-0=3, so 3675    (b: borrow)
  multiply  7*8=56 c5, 6*8+5=53 c5, 5*8+5=45 c4, 4*8+4=36, so 36536  (by each digit, then the partial sums)
  divide    45/8=5 (8*5=40) r5, 56/8=7 (8*7=56) r0, 7/8=0 r7, so 570 r7   (long division; each digit's product
            shown, so the remainder is a subtraction; easy cases as the product: 8*7=56, so 7)
Negative operands are reduced to these with a sign rule stated first.
"""


def _low_first(n):
    return [int(c) for c in reversed(str(n))]


def add_columns(a, b):
    """a, b >= 0."""
    da, db = _low_first(a), _low_first(b)
    steps, carry = [], 0
    for i in range(max(len(da), len(db))):
        x = da[i] if i < len(da) else 0
        y = db[i] if i < len(db) else 0
        total = x + y + carry
        step = f"{x}+{y}" + ("+1" if carry else "") + f"={total}"
        carry = 1 if total >= 10 else 0
        steps.append(step + (" c1" if carry else ""))
    return ", ".join(steps) + f", so {a + b}"


def sub_columns(a, b):
    """a >= b >= 0."""
    da, db = _low_first(a), _low_first(b)
    steps, borrow = [], 0
    for i, x in enumerate(da):
        y = db[i] if i < len(db) else 0
        top = x - borrow
        step = f"{x}" + ("-1" if borrow else "") + f"-{y}"
        if top < y:
            step += f" b {top + 10}-{y}={top + 10 - y}"
            borrow = 1
        else:
            step += f"={top - y}"
            borrow = 0
        steps.append(step)
    return ", ".join(steps) + f", so {a - b}"


def mul_digit(a, d):
    """a >= 0 times one digit d."""
    da = _low_first(a)
    steps, carry = [], 0
    for i, x in enumerate(da):
        product = x * d + carry
        step = f"{x}*{d}" + (f"+{carry}" if carry else "") + f"={product}"
        last = i == len(da) - 1
        carry = 0 if last else product // 10
        steps.append(step + (f" c{carry}" if carry else ""))
    return ", ".join(steps) + f", so {a * d}"


def is_easy(op, a, b):
    """Facts a small model recalls in one line (times tables, small sums)."""
    if op in "+-":
        return a <= 10 and b <= 10
    if op == "*":
        return a <= 12 and b <= 12 or b in (1, 10, 100, 1000) or a in (1, 10, 100, 1000)
    return b <= 10 and a <= 10 * b and a % b == 0


def mul_steps(a, b):
    """a, b >= 0; the multiplier is the operand with fewer digits."""
    if is_easy("*", a, b):
        return f"{a}*{b}={a * b}"
    big, small = (a, b) if len(str(a)) >= len(str(b)) else (b, a)
    if small < 10:
        return mul_digit(big, small)
    parts, texts = [], []
    for place, d in enumerate(_low_first(small)):
        if d == 0:
            continue
        value = big * d * 10 ** place
        shifted = f", shifted {value}" if place else ""
        texts.append(f"{big}*{d}: " + mul_digit(big, d) + shifted)
        parts.append(value)
    total, text = parts[0], "; ".join(texts)
    for value in parts[1:]:
        text += f"; add {total}+{value}: " + add_columns(total, value)
        total += value
    return text + (f"; so {big * small}" if len(parts) == 1 else "")


def div_steps(a, b):
    """a >= 0, 1 <= b <= 99: long division. -> (text, quotient, remainder)."""
    q, r = divmod(a, b)
    if is_easy("/", a, b):
        return f"{b}*{q}={a}, so {q}", q, r
    digits = str(a)
    steps, current, index, quotient = [], 0, 0, ""
    while index < len(digits) and current * 10 + int(digits[index]) < b and index < len(digits) - 1:
        current = current * 10 + int(digits[index])
        index += 1
    for ch in digits[index:]:
        current = current * 10 + int(ch)
        digit = current // b
        rest = current - digit * b
        step = f"{current}/{b}={digit}"
        if digit:
            step += f" ({b}*{digit}={b * digit})"
        steps.append(step + f" r{rest}")
        quotient += str(digit)
        current = rest
    return ", ".join(steps) + f", so {q}" + (f" r{r}" if r else ""), q, r


def solve(op, a, b):
    """Any signs for + - *, and for / a divisor of 1..99 (negative division only when exact).
    -> (analysis text, result int, remainder int or None)."""
    if op == "+":
        if a >= 0 and b >= 0:
            return (f"{a}+{b}={a + b}" if is_easy("+", a, b) else add_columns(a, b)), a + b, None
        if a < 0 and b < 0:
            return f"both negative: -({-a}+{-b}). " + _plain("+", -a, -b) + f", so {a + b}", a + b, None
        pos, neg = (a, -b) if a >= 0 else (b, -a)
        if pos >= neg:
            return f"{pos}-{neg}: " + _plain("-", pos, neg), a + b, None
        return f"-({neg}-{pos}): " + _plain("-", neg, pos) + f", so {a + b}", a + b, None
    if op == "-":
        if a >= 0 and b >= 0:
            if a >= b:
                return (f"{a}-{b}={a - b}" if is_easy("-", a, b) else sub_columns(a, b)), a - b, None
            return f"{b} is larger: -({b}-{a}). " + _plain("-", b, a) + f", so {a - b}", a - b, None
        text, result, _ = solve("+", a, -b)
        return f"{a}-({b}) = {a}+{-b}. " + text, result, None
    if op == "*":
        sign = "-" if (a < 0) != (b < 0) and a and b else ""
        text = mul_steps(abs(a), abs(b))
        if a < 0 or b < 0:
            text = ("signs differ, so negative. " if sign else "both negative, so positive. ") + text
            text += f", so {a * b}"
        return text, a * b, None
    negative = (a < 0) != (b < 0)
    text, q, r = div_steps(abs(a), abs(b))
    if negative:
        return "signs differ, so negative. " + text + f", so {-q}", -q, None
    return text, q, (r if r else None)


def _plain(op, a, b):
    if op == "+":
        return f"{a}+{b}={a + b}" if is_easy("+", a, b) else add_columns(a, b)
    return f"{a}-{b}={a - b}" if is_easy("-", a, b) else sub_columns(a, b)
