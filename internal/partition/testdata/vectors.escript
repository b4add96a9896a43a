#!/usr/bin/env escript
%% For each key of the file: the key, erlang:phash2/1 of it, and the
%% bucket the consistent-hash exchange's jump hash picks among 3, 256
%% and 1000 buckets.
main([File]) ->
    {ok, Bin} = file:read_file(File),
    Keys = binary:split(Bin, <<"\n">>, [global, trim_all]),
    lists:foreach(fun(K) ->
        H = erlang:phash2(K),
        io:format("~s ~b ~b ~b ~b~n", [K, H, jch(H, 3), jch(H, 256), jch(H, 1000)])
    end, Keys).
jch(_K, 1) -> 0;
jch(K, N) -> S = rand:seed_s(exs1024, {K, K, K}), v(-1, 0, N, S).
v(B, J, N, _S) when J >= N -> B;
v(_B0, J0, N, S0) -> B = J0, {R, S} = rand:uniform_s(S0), J = trunc((B + 1) / R), v(B, J, N, S).
