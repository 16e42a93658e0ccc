"""Row kernels: summing duplicate ids' gradients, and the row optimizers fused with the gather
and scatter. Arrays are 2-d (rows x row width); scalars come in the table's dtype, so float32
tables compute in float32, as numpy does with Python scalars (bit for bit the same). Divisions
follow numpy's error model (IEEE results, no zero-division check), which lets them vectorise."""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def sum_into(total, inverse, grads):
    """``total[inverse[k]] += grads[k]`` for k in order (``np.add.at``'s sums)."""
    for k in range(len(inverse)):
        row = inverse[k]
        for j in range(grads.shape[1]):
            total[row, j] += grads[k, j]


@njit(nogil=True, cache=True)
def gather(values, local):
    """The rows at ``local`` (a copy)."""
    out = np.empty((len(local), values.shape[1]), values.dtype)
    for i in range(len(local)):
        row = local[i]
        for j in range(values.shape[1]):
            out[i, j] = values[row, j]
    return out


@njit(nogil=True, cache=True)
def scatter(out, where, rows):
    """``out[where[i]] = rows[i]`` (a pull's reply put in place)."""
    for i in range(len(where)):
        row = where[i]
        for j in range(rows.shape[1]):
            out[row, j] = rows[i, j]


@njit(nogil=True, cache=True)
def sgd(values, local, grads, lr):
    """p -= lr * g on the rows at ``local``."""
    for i in range(len(local)):
        row = local[i]
        for j in range(values.shape[1]):
            values[row, j] -= lr * grads[i, j]


@njit(nogil=True, cache=True)
def momentum(values, velocity, local, grads, lr, mu):
    """v = mu * v + g;  p -= lr * v on the rows at ``local``."""
    for i in range(len(local)):
        row = local[i]
        for j in range(values.shape[1]):
            v = velocity[row, j] * mu
            v += grads[i, j]
            velocity[row, j] = v
            values[row, j] -= lr * v


@njit(nogil=True, cache=True, error_model="numpy")
def adagrad(values, accumulator, local, grads, lr, eps):
    """a += g^2;  p -= lr * g / (sqrt(a) + eps) on the rows at ``local``."""
    for i in range(len(local)):
        row = local[i]
        for j in range(values.shape[1]):
            g = grads[i, j]
            a = accumulator[row, j] + g * g
            accumulator[row, j] = a
            values[row, j] -= lr * g / (np.sqrt(a) + eps)


@njit(nogil=True, cache=True, error_model="numpy")
def adam(values, m, v, local, grads, lr, beta1, beta2, one_minus1, one_minus2, correction1, correction2, eps):
    """Adam on the rows at ``local`` (``correction``: 1 - beta ** step)."""
    for i in range(len(local)):
        row = local[i]
        for j in range(values.shape[1]):
            g = grads[i, j]
            mm = m[row, j] * beta1
            mm += one_minus1 * g
            vv = v[row, j] * beta2
            vv += one_minus2 * g * g
            m[row, j] = mm
            v[row, j] = vv
            values[row, j] -= lr * (mm / correction1) / (np.sqrt(vv / correction2) + eps)


@njit(nogil=True, cache=True)
def merge_runs(ids, grads, counts, id_start, grad_start, widths, out_ids, out_grads, out_counts, out_first):
    """Per segment s: its items (``ids``, rows of ``widths[s]`` elements in the flat ``grads``)
    come as one sorted run of unique ids per sender r (``counts[r, s]`` items, senders in order,
    from ``id_start[s]`` / ``grad_start[s]``); each id's rows summed in sender order into
    ``out_ids`` / ``out_grads`` at the same starts, ``out_counts[s]`` ids: the sums
    ``updates.sum_rows`` makes (0 + each sender's row, in order; a lone run copied), bit for bit.
    ``out_first``: where each summed id first came among its segment's items."""
    senders = counts.shape[0]
    at = np.empty(senders, np.int64)
    end = np.empty(senders, np.int64)
    for s in range(counts.shape[1]):
        width, first, runs = widths[s], id_start[s], 0
        for r in range(senders):
            at[r] = first
            first += counts[r, s]
            end[r] = first
            runs += counts[r, s] > 0
        n = 0
        while True:
            low, found = 0, False
            for r in range(senders):
                if at[r] < end[r] and (not found or ids[at[r]] < low):
                    low, found = ids[at[r]], True
            if not found:
                break
            out_ids[id_start[s] + n] = low
            came = -1
            row = grad_start[s] + n * width
            if runs > 1:
                for j in range(width):
                    out_grads[row + j] = 0
            for r in range(senders):
                if at[r] < end[r] and ids[at[r]] == low:
                    if came < 0:
                        came = at[r] - id_start[s]
                    src = grad_start[s] + (at[r] - id_start[s]) * width
                    if runs > 1:
                        for j in range(width):
                            out_grads[row + j] += grads[src + j]
                    else:
                        for j in range(width):
                            out_grads[row + j] = grads[src + j]
                    at[r] += 1
            out_first[id_start[s] + n] = came
            n += 1
        out_counts[s] = n


@njit(nogil=True, cache=True)
def pooled_grad(out, inverse, bag_of, grad, scale):
    """``out[inverse[k]] += grad[bag_of[k]] * scale[k]`` for every lookup k in order (no
    ``scale``: an empty array, factor 1): a sum-pooled bag's backward into its rows, as
    ``index_select`` then ``index_add_`` compute it, without the per-lookup copy."""
    scaled = len(scale) > 0
    for k in range(len(inverse)):
        row, bag = inverse[k], bag_of[k]
        if scaled:
            factor = scale[k]
            for j in range(out.shape[1]):
                out[row, j] += grad[bag, j] * factor
        else:
            for j in range(out.shape[1]):
                out[row, j] += grad[bag, j]
