#!/usr/bin/env python3
"""tools/check_modules.py - the lines between dtrain's modules are real (make test, tests/run.sh section 2).

The modules are the files dtrain.h includes from dtrain/, in its order, then the backends dtrain_mpi.h and
dtrain_cuda.h. Each has a declaration part (up to the line #endif /* DTRAIN_<NAME>_H */ that closes its
include guard) and an implementation part (after it). A module may use, of a module before it:
  - its declaration part: the public API, and the dt__/DT__ names a module declares there for the library
    (e.g. backend.h's request dt__req), which its top comment says are internal;
  - the platform layer: every internal name dtrain/core/base.h defines (threads, locks, atomics, the OpenMP
    and restrict macros, files, the trace recorder), except its error buffer dt__errmsg (use dt_set_error or
    a call of base.h);
  - the registration hooks the composition root defines (dtrain.h's #define DT__...: DT__LAUNCH_PROCESSES,
    DT__DEFAULT_BACKEND), which the module that calls them tests with #ifdef;
  - what the internal headers declare (dtrain/core/internal.h, the calls between modules, and dtrain/cpu/kernel.h,
    the CPU kernel seam) under the heading of the module that provides it ("/* ==== dtrain/x/y.h" and then
    "#ifdef DTRAIN_Y_IMPLEMENTATION_DONE", which that module defines where its implementation part begins): the
    prototypes of its static calls (which it must define), and the types and macros the group itself defines
    (e.g. the kernel table dt__kernel): the only doors between modules' implementation parts, like ggml's
    backend-impl header. A public type's body there (struct dt_comm, in backend.h's group) is a view for the
    modules of its provider's folder (dtrain/comm/): to the others its fields stay private;
and never another module's other internal names (dt__..., DT__...: static helpers, private macros, enum
constants and types of an implementation part) or the fields of its private structures (a public type whose
body is in the implementation part, e.g. struct dt_model, or in an internal header for another folder, read
through a pointer: m->nparams, also in a chain such as k->m->nparams or d->comm->stats).
Prints each failure (any crossing is one), then a total line; exit status 1 on any.
--list prints every use across a module line as MODULE PROVIDER NAME, a crossing marked (CROSSING).
"""
import re, sys, os, collections

os.chdir(os.environ.get('DT_ROOT') or os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
INTERNALS = ['dtrain/core/internal.h', 'dtrain/cpu/kernel.h']
PLATFORM = 'dtrain/core/base.h'
PLATFORM_PRIVATE = {'dt__errmsg'}

def strip(s):
    """comments and string literals out, line numbers kept"""
    s = re.sub(r'/\*.*?\*/', lambda m: '\n' * m.group(0).count('\n'), s, flags=re.S)
    s = re.sub(r'//[^\n]*', '', s)
    s = re.sub(r"'(\\.|[^'\\\n])'", "' '", s)
    return re.sub(r'"(\\.|[^"\\\n])*"', '""', s)

def split_decl(s):
    """(declarations, implementation, guard) of a module, comments out: the guard's closing line splits them"""
    m = re.search(r'^#endif /\* (DTRAIN_\w+_H) \*/', s, re.M)
    return (strip(s[:m.end()]), strip(s[m.end():]), m.group(1)) if m else ('', strip(s), None)

def defined_names(s):
    """the dt__/DT__ names a piece of a module defines: macros, functions, types, variables, enum constants"""
    d = set()
    d |= set(re.findall(r'^\s*#\s*define\s+((?:dt__|DT__)\w+)', s, re.M))
    d |= set(re.findall(r'^(?!\s*(?:return|if|else|while|for|switch|case|do)\b)[A-Za-z_][^;{}()=]*?\b(dt__\w+)\s*\([^;{]*?\)\s*\{',
                        s, re.S | re.M))   # function definitions: a type, the name, the parameters, the body
    d |= set(re.findall(r'\}\s*(dt__\w+)\s*;', s))
    d |= set(re.findall(r'typedef\s+[^;{]*?\b(dt__\w+)\s*(?:__attribute__\s*\(\(.*?\)\)\s*)?;', s))
    d |= set(re.findall(r'typedef\s+[^;{()]*?\(\s*\*\s*(dt__\w+)\s*\)', s))
    d |= set(re.findall(r'\b(?:struct|union|enum)\s+(dt__\w+)\s*\{', s))
    d |= set(re.findall(r'^(?:static\s+)?(?:DT__THREAD_LOCAL\s+)?(?:const\s+)?[A-Za-z_][\w \*]*?[\s\*]+(dt__\w+)\s*(?:\[[^\]]*\])*\s*(?:=|;)', s, re.M))
    for body in re.findall(r'\benum\s*\w*\s*\{([^}]*)\}', s):   # enum constants
        d |= set(re.findall(r'(?:^|,)\s*((?:DT__|dt__)\w+)', body))
    return d

PTR_DECL = r'\b(dt_\w+)\s*\*\s*(?:const\s+)?(\w+)\s*(?=[;,)=\[])'   # dt_x *name, a parameter, variable or field

def chunks(s):
    """the top-level pieces of a module: each function definition, struct, declaration (brace depth 0 to 0)"""
    directive = r'^[ \t]*#(?:[^\n]*\\\n)*[^\n]*'   # a preprocessor line (with its continuations): a piece of its own
    out = re.findall(directive, s, re.M)
    s = re.sub(directive, lambda m: '\n' * m.group(0).count('\n'), s, flags=re.M)
    s = re.sub(r'extern\s*""\s*\{', '', s)   # extern "C" { ... }: its body is top level (its } is ignored below)
    depth, start = 0, 0
    for i, ch in enumerate(s):
        if ch == '{': depth += 1
        elif ch == '}':
            depth = max(depth - 1, 0)
            if depth == 0 and not re.match(r'\s*\w*\s*;', s[i + 1:i + 80]): out.append(s[start:i + 1]); start = i + 1
        elif ch == ';' and depth == 0: out.append(s[start:i + 1]); start = i + 1
    out.append(s[start:])
    return out

def field_reads(s, private, me):
    """(type, field) of each read through a pointer to a struct private to others (private: type -> the modules
    that may read its fields): p->f where p is a parameter or variable of the function it is in (or a file-scope
    variable), and chains a->p->f where p is a field declared in one of the module's structs"""
    def ptrs(text):
        d = collections.defaultdict(set)
        for t, n in re.findall(PTR_DECL, text):
            if t in private and me not in private[t]: d[n].add(t)
        return d
    parts = chunks(s)
    fields, top = collections.defaultdict(set), collections.defaultdict(set)
    for c in parts:
        if re.match(r'\s*(?:typedef\s+)?(?:struct|union)\b[^(]*\{', c):
            for n, ts in ptrs(c).items(): fields[n] |= ts
        elif '{' not in c:
            for n, ts in ptrs(c).items(): top[n] |= ts
    out = []
    for c in parts:
        local = ptrs(c)
        for m in re.finditer(r'(?<![\w])(\w+)(?=\s*->\s*(\w+))', c):   # overlapping: a->b->c gives a->b and b->c
            n, f = m.group(1), m.group(2)
            chained = re.search(r'(->|\.)\s*$', c[:m.start()])
            for t in (fields.get(n, ()) if chained else local.get(n) or top.get(n, ())):
                out.append((t, f))
    return out

def main():
    listing = '--list' in sys.argv
    raw = open('dtrain.h').read()
    top = strip(raw)
    mods = re.findall(r'^#include "(dtrain/[a-z0-9_/]+\.h)"', raw, re.M) + ['dtrain_mpi.h', 'dtrain_cuda.h']
    hooks = set(re.findall(r'^\s*#\s*define\s+(DT__\w+)', top, re.M))
    src, decl, impl, guard, defs, decl_defs = {}, {}, {}, {}, {}, {}
    fails, done = [], {}
    for m in mods:
        raw = open(m).read()
        s = strip(raw)
        src[m] = s
        decl[m], impl[m], guard[m] = split_decl(raw)
        d = re.search(r'^#define (DTRAIN_\w+_IMPLEMENTATION_DONE)', raw, re.M)
        done[m] = d.group(1) if d else None
        if not guard[m]: fails.append(f'{m}: no line #endif /* DTRAIN_<NAME>_H */ closes its declarations')
        defs[m] = defined_names(s)
        decl_defs[m] = defined_names(decl[m])
    # the internal headers: "/* ==== dtrain/x/y.h" headings, each group under #ifdef of that module's guard
    declared = collections.defaultdict(set)   # module -> the names an internal header declares for it
    views = {}                                # public type -> its provider, where its body is in an internal header
    view_readers = {}                         # such a type -> its readers, where its group's heading names them
    for hdr in INTERNALS:
        if not os.path.exists(hdr): fails.append(f'{hdr}: missing'); continue
        cur, cur_guard, body, readers = None, None, collections.defaultdict(list), None
        for no, line in enumerate(strip_keep_headings(open(hdr).read()).split('\n'), 1):
            h = re.match(r'\s*/\* =+ (\S+\.h)', line)
            if h:
                cur, cur_guard = h.group(1), None
                rb = re.search(r'\(read by ([^)]*)\)', line)
                readers = re.findall(r'dtrain/[a-z0-9_/]+\.h', rb.group(1)) if rb else None
                if cur not in mods: fails.append(f'{hdr}:{no}: heading {cur} is not a module')
                continue
            g = re.match(r'\s*#\s*ifdef\s+(\w+)', line)
            if g and cur and cur_guard is None:
                cur_guard = g.group(1)
                if cur in done and done[cur] != cur_guard:
                    fails.append(f'{hdr}:{no}: the group of {cur} must be under #ifdef {done[cur]}')
                continue
            names = re.findall(r'^\s*#\s*define\s+((?:dt__|DT__)\w+)', line) if re.match(r'\s*#', line) else \
                re.findall(r'\b((?:dt__|DT__)\w+)\s*\(', line)   # a macro it defines, or a prototype
            if not re.match(r'\s*#', line) and line.strip() or names:
                if not cur or cur_guard is None:
                    fails.append(f'{hdr}:{no}: {line.strip()[:40]}... is not under a module heading and its #ifdef'); continue
            if cur: body[cur].append(line)
            v = re.match(r'^\s*struct (dt_[a-z]\w*) \{', line)
            if v and cur and readers is not None: view_readers[v.group(1)] = {cur, *readers}
            for n in names:
                if not line.lstrip().startswith('#') and n not in defs.get(cur, ()):
                    fails.append(f'{hdr}:{no}: {n} is declared for {cur}, which does not define it')
                declared[cur].add(n)
        for m, lines in body.items():   # the types a group defines (its macros are above) are its module's
            text = '\n'.join(lines)
            own = {n for n in defined_names(text) if not re.search(r'\b' + n + r'\s*\(', text) or
                   re.search(r'typedef[^;]*\(\s*\*\s*' + n + r'\s*\)', text)}
            declared[m] |= own
            defs[m] = defs.get(m, set()) | own
            for t in re.findall(r'^\s*struct (dt_[a-z]\w*) \{', text, re.M):
                views[t] = m
    # private structures: a public type (dt_...) whose body is in a module's implementation part (readers: that
    # module), or in an internal header's group (readers: the modules of its provider's folder)
    private = {}
    for m in mods:
        for t in re.findall(r'^struct (dt_\w+) \{', impl[m], re.M):
            private[t] = {m}
    for t, m in views.items():
        private[t] = view_readers.get(t) or {x for x in mods if os.path.dirname(x) == os.path.dirname(m)}
    crossings = []   # (module, provider, name, allowed by the rule)
    for i, m in enumerate(mods):
        before = mods[:i] if m != 'dtrain_mpi.h' and m != 'dtrain_cuda.h' else [x for x in mods if x != m]
        for n in sorted(set(re.findall(r'\b((?:dt__|DT__)\w+)', src[m]))):
            if n in defs[m]: continue                        # its own (also when an earlier module has one)
            if n in hooks: continue                          # registration hooks of the composition root
            owners = [o for o in before if n in defs[o]]
            if not owners: continue                          # a parameter of a macro, or defined nowhere
            o = owners[-1]
            ok = (o == PLATFORM and n not in PLATFORM_PRIVATE) or n in decl_defs[o] or n in declared[o]
            crossings.append((m, o, n, ok))
        # fields of other modules' private structures, read through pointers (variables, parameters, fields)
        for t, f in sorted(set(field_reads(src[m], private, m))):
            crossings.append((m, views.get(t) or next(iter(private[t])), f'{t}.{f}', False))
    for m, o, n, ok in crossings:
        if ok: continue
        what = f'reads field {n.split(".")[1]} of {o}\'s private struct {n.split(".")[0]}' if '.' in n \
            else f'uses {n} of {o}, which neither its declarations nor an internal header ({", ".join(INTERNALS)}) declare'
        fails.append(f'{m}: {what} (a crossing of a module line: see docs/design.md, "The modules")')
    if listing:
        for m, o, n, ok in crossings:
            print(f'{m} {o} {n}{"" if ok else "  (CROSSING)"}')
    for f in fails: print(f)
    nout = sum(1 for c in crossings if not c[3])
    print(f'{len(mods)} modules: {len(crossings) - nout} uses through declarations and the internal headers, {nout} crossings, '
          f'{len(fails)} failures')
    return 1 if fails else 0

def strip_keep_headings(s):
    """an internal header without comments, but its "/* ==== module" heading lines kept (with their "(read by ...)")"""
    s = re.sub(r'/\*\s*=+ (\S+\.h)[^\n]*', lambda m: '/* ==== ' + m.group(1) +
               ''.join(' ' + r for r in re.findall(r'\(read by [^)]*\)', m.group(0))) + ' */', s)
    return re.sub(r'/\*(?! ==== ).*?\*/', lambda m: '\n' * m.group(0).count('\n'), s, flags=re.S)

sys.exit(main())
